"""The settings of `make demo`'s web server and watcher (DJANGO_SETTINGS_MODULE in
tools/demo.py): the checkout's own, plus the flag that labels the demo's times.

The demo draws each pod's startup and run time by the node's warmth class
(tools/demo.py, STARTUP and RUN), so every "time saved" it shows is made up: with this
flag the admin index and the pipeline page say so next to it.
"""

from kssched.settings import *  # noqa: F403

KSSCHED_SIMULATED_TIMES = True
