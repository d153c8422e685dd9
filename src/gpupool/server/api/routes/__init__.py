"""The API's routes: one module per resource, each with one APIRouter (ops.py has three,
one per guard) whose routes app.create_app adds to the app in the order of app.ROUTERS.

Adding a route: put it in its resource's module; declare what it needs in its signature
(deps.Who, Db, Live, Api) and read its body and write its answer with schemas.py. A route
module imports no other route module and not app.py. Leave the existing routes in their
order: it is the order requests are matched in and the OpenAPI document's.
"""
