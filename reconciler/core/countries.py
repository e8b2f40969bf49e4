"""ISO 3166-1 alpha-2 country codes with English names: the data behind ``reconciler.core.offers.country_code``.

The countries come from ``pycountry`` (the ISO 3166 database as Debian's iso-codes keeps it): the standard
changes (Czechia, Eswatini, North Macedonia, Türkiye were all renamed within a few years), and a well-kept
package tracks it where a hand-written table of 249 entries silently ages. Pure data, no logic: ``NAMES`` maps
every officially assigned alpha-2 code to its common English short name; ``ALIASES`` adds pycountry's other
names for the same country (the ISO short and official forms where the common one differs, e.g.
"Viet Nam" and "Socialist Republic of Viet Nam" for "Vietnam") and the few names ISO no longer gives that the
Vast.ai market's ``geolocation`` strings ("Sweden, SE", "Vietnam, VN", "California, US") and the people
writing desired/ still use. The resolver compares names case-insensitively with accents and runs of spaces
folded.
"""

from __future__ import annotations

import pycountry


def _names() -> tuple[dict[str, str], dict[str, str]]:
    names: dict[str, str] = {}
    aliases: dict[str, str] = {}
    for country in pycountry.countries:
        code = str(country.alpha_2)
        short = str(getattr(country, "common_name", None) or country.name)
        names[code] = short
        for other in (country.name, getattr(country, "official_name", None)):
            if other and other != short:
                aliases[str(other)] = code
    return names, aliases


NAMES, _ISO_ALIASES = _names()

# Names ISO 3166 does not give (or no longer gives) that market strings and people use. "UK" is not an ISO code
# (GB is), but it is what people write: an alias here, not a code.
_COMMON: dict[str, str] = {
    "USA": "US",
    "UK": "GB",
    "Turkey": "TR",
    "Russia": "RU",
}

ALIASES: dict[str, str] = {**_ISO_ALIASES, **_COMMON}
