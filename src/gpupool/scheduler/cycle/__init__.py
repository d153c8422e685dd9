"""The stages of a scheduling cycle, each a plug-in (`base.py`: Stage, CycleContext,
Published), in the order `order.py` gives.

Rules for stage authors:
1. A stage owns the state only it reads: its fields live on the stage object.
2. It reads another stage's decisions only through `ctx.published`, and its docstring says
   which ("reads `deferred` from PriceDeferral").
3. It changes shared state only through the job book's and the fleet's methods (never by
   assigning their fields), and returns the commands it decided.
4. It is built only when the configuration wants it (the core decides at construction).
5. Add one: a module here with a class that has `name` and `run(ctx)`, its place in
   `order.py`, its construction in `Scheduler.__init__`, and a test driven through a core.
"""
