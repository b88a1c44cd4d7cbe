"""Dates in the admin as operators read logs: 2026-01-05 09:41 (UTC, see TIME_ZONE).

Shorter than Django's "Jan. 5, 2026, 9:41 a.m.", so a change list with two dates
still fits a 1024 px screen.
"""

DATE_FORMAT = "Y-m-d"
DATETIME_FORMAT = "Y-m-d H:i"
SHORT_DATE_FORMAT = "Y-m-d"
SHORT_DATETIME_FORMAT = "Y-m-d H:i"
