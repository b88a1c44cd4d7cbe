#!/usr/bin/env python
"""Django's command-line utility for ks-scheduler.

In a checkout, `make run` writes a `.env` beside this file (secret key, data under
`var/`); when it is there, the settings read it (KSSCHED_READ_DOT_ENV=1), so
`.venv/bin/python manage.py …` needs no other environment. Real environment
variables still win, and KSSCHED_READ_DOT_ENV=0 turns the file off. The image has
no `.env`.

Every variable is parsed before the command runs (kssched.variables): a bad value
stops it with one line naming the variable, its value and what is allowed.
"""

import importlib.util
import os
import sys
from pathlib import Path


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kssched.settings")
    if (Path(__file__).resolve().parent / ".env").is_file():
        os.environ.setdefault("KSSCHED_READ_DOT_ENV", "1")
    if importlib.util.find_spec("django") is None:
        sys.exit(
            f"ks-scheduler: Django is not installed for {sys.executable}: run "
            "`make run`, or use .venv/bin/python manage.py ..."
        )
    # Before Django is imported, so a bad value stops the command at once.
    from kssched import variables

    variables.check()
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except variables.SettingError as exc:
        # Raised by kssched/settings.py for a rule check() cannot see (DATA_PATH).
        sys.exit(variables.PREFIX + str(exc))


if __name__ == "__main__":
    main()
