"""What broke in the newest release of an engine, from the JUnit XML of its plugin tests:
`python3 .ci/verdict.py NAME VERSION PINNED TESTS.xml VERSION_TEST.xml`. One line a cause,
each starting "NEWEST NAME VERSION:", told apart by which tests failed:

- a patch no longer applies: a patch point or a caller it refuses to is not as read
  (test_every_patch_point_is_as_read);
- a new path is unmodelled: a file of the release names an all-reduce mechanism that no path
  of engines.json covers (test_every_all_reduce_site_is_modelled, which lists the files);
- the plugin's dispatch or start-up tests fail: any other test;
- the version line is new: only test_the_engine_model_was_read_against_the_installed_release
  fails (run apart, VERSION_TEST.xml), so nothing but the version differs.

Exit 0 when nothing but the version differs, 1 otherwise (the caller only reports it)."""

import sys
import xml.etree.ElementTree as ET

PATCH = ("test_every_patch_point_is_as_read",)
SITES = ("test_every_all_reduce_site_is_modelled",)


def failures(path):
    """(test name, first line of its failure message) of every failed or erroring test."""
    out = []
    for case in ET.parse(path).iter("testcase"):
        for bad in list(case.findall("failure")) + list(case.findall("error")):
            msg = (bad.get("message") or bad.text or "").strip().splitlines()
            out.append((case.get("name", "?"), msg[0] if msg else ""))
    return out


def main() -> int:
    name, version, pinned, tests, version_test = sys.argv[1:]
    head = f"NEWEST {name} {version}:"
    failed = failures(tests)
    patch = [(t, m) for t, m in failed if t.split("[")[0] in PATCH]
    sites = [(t, m) for t, m in failed if t.split("[")[0] in SITES]
    other = [(t, m) for t, m in failed if (t, m) not in patch + sites]
    for t, m in patch:
        print(f"{head} a patch no longer applies ({t}: {m})")
    for t, m in sites:
        print(f"{head} a new path is unmodelled ({m}); read it and add it to "
              "python/artune/engines.json")
    if other:
        print(f"{head} the plugin's dispatch or start-up tests fail: "
              + ", ".join(t for t, _ in other))
    if failures(version_test):
        print(f"{head} the version line is new (engines.json was read against {pinned})"
              + ("; nothing else differs: read the release against engines.json and bump the "
                 "pin" if not failed else ""))
    if not failed:
        print(f"{head} passes the plugin tests, the patch points and the call-site scan")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
