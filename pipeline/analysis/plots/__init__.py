"""The analysis stage's pictures: the figures drawn from tables/ (figures.py) and the offline HTML template for
`dvc plots show` (dvc_template.py).

Built on tables/ only; plots/ and report/ do not import each other.
"""
