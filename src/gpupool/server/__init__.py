"""The live server: the decision core driven by a database, an executor and telemetry.

api/        the REST API: routes, schemas, admission, the dashboard
store/      the durable state (SQLite or PostgreSQL), one transaction per call
loop/       the live driver: observe, step the core, carry its commands out
executors/  where jobs run: local processes, Ray nodes, the job shim, MPS
telemetry/  what the GPUs and services measure: NVML, Ray, Prometheus, history
isolation/  who a job runs as and what it may use: users, cgroups
security/   API credentials and the audit trail
ha/         one controller per database: the lease and the standby
fleet/      sites and cloud nodes
main.py     opens the ports and runs the server (`gpupool serve`)
"""
