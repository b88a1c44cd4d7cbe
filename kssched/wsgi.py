"""WSGI entry point: `gunicorn -c kssched/gunicorn_conf.py kssched.wsgi`."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kssched.settings")

application = get_wsgi_application()
