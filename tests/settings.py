"""Settings for the test suite: the real settings, fed explicit test values.

Tests never depend on the developer's shell: the values below are set before
`kssched.settings` reads the environment. DATABASE_URL is kept when given, so the
same suite runs against PostgreSQL.
"""

import os
import tempfile
from pathlib import Path

_data_dir = Path(tempfile.mkdtemp(prefix="kssched-test-"))
os.environ["SECRET_KEY"] = "test-secret-key-not-for-production-0123456789abcdef"
os.environ["DEBUG"] = "0"
os.environ["DATA_PATH"] = str(_data_dir / "scheduler.db")
os.environ["KSSCHED_TEST_DATABASE"] = str(_data_dir / "test.db")
os.environ.pop("KSSCHED_READ_DOT_ENV", None)
os.environ.pop("VERSION", None)
# The endpoint, admin and end-to-end tests are written against the seed formula;
# the warm strategy's tests select it explicitly.
os.environ["KSSCHED_SCORING"] = "seed"

from kssched.settings import *  # noqa: E402, F403

TEST_DATA_DIR = _data_dir
