"""The shop's Django project. Its Celery app is loaded with it, so that ``celery -A shop_project`` finds it."""

from shop_project.celery import app as celery_app

__all__ = ["celery_app"]
