"""The REST API (FastAPI) of the live server.

Contract: the API is its routes, their order, status codes, bodies, headers and error
messages, and the OpenAPI document `create_app(...).openapi()` derives from them; clients,
the dashboard and tests/server/api/test_api_fuzz.py hold it. `app.create_app` builds one
app: the shared handles (deps.ApiState at app.state.api), the error handlers, the routers of
routes/ in a fixed order (app.ROUTERS), the body limit (limits.py) and the audit middleware.
A route reaches what it needs only through its signature: `who: Who` (the token's
principal), `store: Db`, `service: Live`, `api: Api` (deps.py); the ownership checks
(deps.admin_only, own, own_service) are calls in its body, after FastAPI has validated the
request.

Adding an endpoint: the rows it reads or writes (gpupool.server.store.rows), a method on the
store repository that owns them (store.jobs, store.services, ...: one transaction each), its
request model and JSON renderer (schemas.py), then the route in the routes/ module of its
resource. A router is new only for a new resource; it goes last in app.ROUTERS, since moving
a route changes the OpenAPI document's order and which of two overlapping paths matches
first (POST /v1/jobs/batch before /v1/jobs/{job_id}).
"""
