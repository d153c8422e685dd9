"""The API harness's fixtures (`db`, `url`, `empty_url`, `make_api`, `api`, `secured`, and `pg_url`
behind them) for the server's tests: a module that defines a fixture of the same name uses
its own."""

from api_harness import api, db, empty_url, make_api, secured, url  # noqa: F401
from pgserver import pg_url  # noqa: F401
