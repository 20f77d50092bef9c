"""The sweep tests' shared fixtures: test_scaleout.py's PostgreSQL cluster and mlflow server (scaleout_services.py)."""

from tests.sweep.scaleout_services import mlflow_server, postgres  # noqa: F401 (fixtures)
