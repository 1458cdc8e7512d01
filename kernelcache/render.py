"""What the pod-start verbs print, shared by the click commands (cli/) and the click-free entry point (entry.py).

Standard library only, besides ``bundle.trust.said``: entry.py renders a no-op ``install`` on every pod start and
loads neither click nor rich.
"""

from __future__ import annotations


def install_summary(result: dict, as_json: bool) -> str:
    """What ``install`` prints on stdout for ``InstallResult.to_dict()`` (or entry.py's record of a no-op): the
    result less its warnings as JSON, or one line. The warnings go to stderr, one ``warning: ...`` line each."""
    if as_json:
        import json

        return json.dumps({k: v for k, v in result.items() if k != "warnings"}, indent=1)
    from .bundle.trust import said

    signed = said(result.get("signature"))
    tuned = "; autotune choices installed" if result.get("choices") == "installed" else ""
    if result["action"] == "already-installed":
        return f"already installed in {result['cache_dir']} (digest {result['digest'][:16]}){signed}{tuned}"
    return (f"installed {result['written']} entries into {result['cache_dir']} ({result['present']} already there) "
            f"in {result['seconds']:.2f}s{signed}{tuned}")
