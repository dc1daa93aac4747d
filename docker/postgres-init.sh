#!/bin/sh
# First start of the postgres container only (/docker-entrypoint-initdb.d): one login role and
# one database per user of PostgreSQL, each password read from its mounted secret file.
#   airflow      Airflow metadata and the Celery result backend
#   mlflow       MLflow tracking and model registry
#   mlflow_auth  MLflow basic-auth users and permissions
set -eu
for name in airflow mlflow mlflow_auth; do
    file="/run/secrets/$(echo "$name" | tr _ -)-db-password"
    [ -s "$file" ] || { echo "postgres-init: $file is missing or empty" >&2; exit 1; }
    # psql reads the password itself (\set with a backquoted cat of the file) and quotes it
    # (:'pw'): the password is never on a command line.
    psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
         -v role="$name" -v file="$file" <<'SQL'
\set pw `cat :'file'`
CREATE ROLE :"role" LOGIN PASSWORD :'pw';
CREATE DATABASE :"role" OWNER :"role";
REVOKE ALL ON DATABASE :"role" FROM PUBLIC;
SQL
done
