"""The Ductor project: settings, the Celery app (``celery -A ductor_project`` finds
``ductor_project.celery``), URLs, the embedded servers, the low layer every app
stands on (``core``), and the one process supervisor (``stack``). It is a Django
app too, for its ``up`` command (``management/commands/up.py``); the demo is an
app of its own inside it (``demo``, label ``demo``)."""
