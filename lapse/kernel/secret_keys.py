"""Which configuration keys name a secret: settings wrap such `kafka.extra` values as secrets, and
the shell masks them wherever settings are shown."""

from __future__ import annotations

import re

# `kafka.extra` passes any librdkafka setting through, and librdkafka takes secrets under many names
# (sasl.password, ssl.key.password, ssl.keystore.password, sasl.oauthbearer.client.secret,
# ssl.key.pem, sasl.oauthbearer.config, sasl.kerberos… credentials): a key naming a secret is
# masked whatever its exact name, since a new librdkafka release may add more.
SECRET_KEY_WORDS = ("password", "passwd", "passphrase", "secret", "token", "credential", "key.password",
                    "key.pem", "private", "oauthbearer.config", "jaas", "apikey", "api.key", "api_key",
                    "user.info", "userinfo")
# A key whose last part is `key` (`ssl.key`, `client_key`) holds key material; `ssl.key.location` names
# a file and is shown.
_KEY_MATERIAL = re.compile(r"(^|[._\-])key$")


def is_secret_key(key: str) -> bool:
    """Whether a configuration key (`ssl.keystore.password`, `apiToken`, `ssl.key`) names a secret."""
    lowered = key.lower()
    return any(word in lowered for word in SECRET_KEY_WORDS) or bool(_KEY_MATERIAL.search(lowered))
