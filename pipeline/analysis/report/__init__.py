"""report.md and its sections: the document itself (document.py), its first screen and best.yaml (answer.py), how
sure each claim is (confidence.py), the honesty lines (causes.py), the host (host.py), why it scales (why.py), what
sharding saved (sharding.py), memory measured beside modelled (memory_fit.py), and the one markdown table format
(markdown.py).

Built on tables/ only; plots/ and report/ do not import each other.
"""
