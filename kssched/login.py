"""The admin's login form: usernames no account can have are refused before
anyone authenticates them.

django-axes records every failed authentication in a `varchar(255)` column;
PostgreSQL refuses a longer username there (a 500, where SQLite stores it), and
each new username adds a row. A username longer than the User model allows
(150 characters) belongs to no account, so it is a form error: nothing is
authenticated or recorded.
"""

from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError


class AdminLoginForm(AdminAuthenticationForm):
    def clean_username(self) -> str:
        username = self.cleaned_data.get("username") or ""
        longest = get_user_model()._meta.get_field("username").max_length or 150
        if len(username) > longest:
            raise ValidationError(
                "No account has a username longer than %(longest)d characters.",
                code="username_too_long",
                params={"longest": longest},
            )
        return username
