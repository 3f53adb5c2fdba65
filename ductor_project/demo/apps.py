from django.apps import AppConfig


class DemoConfig(AppConfig):
    """``manage.py demo``: the whole platform under a noisy-neighbour workload. No models."""

    name = "ductor_project.demo"
    label = "demo"
