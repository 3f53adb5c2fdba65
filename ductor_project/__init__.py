"""The Ductor project: settings, the Celery app (``celery -A ductor_project`` finds
``ductor_project.celery``), URLs, the embedded servers, the stack supervisor, and
the low layer every app stands on (``core``)."""
