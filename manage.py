#!/usr/bin/env python
"""Django's command-line utility for ks-scheduler.

In a checkout, `make run` writes a `.env` beside this file (secret key, data under
`var/`); when it is there, the settings read it (KSSCHED_READ_DOT_ENV=1), so
`.venv/bin/python manage.py …` needs no other environment. Real environment
variables still win, and KSSCHED_READ_DOT_ENV=0 turns the file off. The image has
no `.env`.
"""

import os
import sys
from pathlib import Path


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kssched.settings")
    if (Path(__file__).resolve().parent / ".env").is_file():
        os.environ.setdefault("KSSCHED_READ_DOT_ENV", "1")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
