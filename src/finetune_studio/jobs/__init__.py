"""The core: phases and transitions, the SQLite store and event log, the job service.

Imports neither FastAPI nor torch; both the server and the tests use it directly.
"""
