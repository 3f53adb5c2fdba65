-- Run once by the PostgreSQL image, as its superuser, in the database POSTGRES_DB (owned by
-- POSTGRES_USER, the tables' owner, who runs migrate). It creates the app role every Ductor
-- process connects as (bound by row-level security) and the maintenance role, as
-- `python manage.py rls_roles` prints them. The app role's password comes from the environment
-- (DUCTOR_APP_DB_PASSWORD, passed to the container), never from this file.
\getenv app_password DUCTOR_APP_DB_PASSWORD
CREATE ROLE ductor_app LOGIN NOSUPERUSER NOBYPASSRLS NOINHERIT PASSWORD :'app_password';
CREATE ROLE ductor_maintenance NOLOGIN NOSUPERUSER NOBYPASSRLS;
GRANT ductor_maintenance TO ductor_app;
GRANT CONNECT ON DATABASE ductor TO ductor_app;
