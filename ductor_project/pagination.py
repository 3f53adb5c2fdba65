"""API pagination: stable cursor pages, newest first, ties broken by id."""

from rest_framework import pagination


class CursorPagination(pagination.CursorPagination):
    ordering = ("-created_at", "-id")
    page_size_query_param = "page_size"
    max_page_size = 500
