"""Kubernetes node names: the names the API server accepts for a Node.

A node name is a DNS-1123 subdomain (apimachinery's IsDNS1123Subdomain): at most
253 characters of lower-case letters, digits, `-` and `.`, each dot-separated part
starting and ending with a letter or digit. The webhook copies stored node names
into `matchFields` `metadata.name` terms, and the API server validates those values
after mutation: a pod given a term with any other name is rejected. So every path
that stores a node name (the admin's forms, the import) refuses other names, and
rows stored before this rule are left out of patches and listed by a system check.
"""

from __future__ import annotations

import re

NODE_NAME_MAX_LENGTH = 253
NODE_NAME_RULE = (
    "A Kubernetes node name: lower-case letters, digits, '-' and '.', each "
    "dot-separated part starting and ending with a letter or digit, at most "
    f"{NODE_NAME_MAX_LENGTH} characters (a DNS-1123 subdomain), e.g. worker-7 or "
    "ip-10-0-1-7.ec2.internal."
)
_PART = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_NODE_NAME = re.compile(rf"{_PART}(?:\.{_PART})*")


def is_valid_node_name(name: object) -> bool:
    """True when `name` is a node name the Kubernetes API server accepts.

    The length is checked first, so text of any size is judged in constant time.
    """
    return (
        isinstance(name, str)
        and 0 < len(name) <= NODE_NAME_MAX_LENGTH
        and _NODE_NAME.fullmatch(name) is not None
    )
