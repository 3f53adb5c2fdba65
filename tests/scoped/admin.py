from django.contrib import admin

from tenants.admin_scoping import TenantScopedAdmin
from tests.scoped.models import Folder, Note

admin.site.register(Folder, TenantScopedAdmin)
admin.site.register(Note, TenantScopedAdmin)
