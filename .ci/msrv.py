"""The minimum Rust version, as far as a machine with one toolchain can check it: every crate
of the workspace declares the root's `rust-version`, and no crate in the build needs a newer
Rust. Reads `cargo metadata` on standard input."""
import json
import sys


def version(s):
    # "1.89" and "1.89.0" are the same version.
    return tuple(int(x) for x in (s.split(".") + ["0", "0"])[:3])


meta = json.load(sys.stdin)
ours = [p for p in meta["packages"] if p["source"] is None]
msrv = next(p["rust_version"] for p in ours if p["name"] == "weir-stream")
wrong = [f"{p['name']} declares {p.get('rust_version')}" for p in ours if p.get("rust_version") != msrv]
wrong += [
    f"{p['name']} {p['version']} needs Rust {p['rust_version']}"
    for p in meta["packages"]
    if p.get("rust_version") and version(p["rust_version"]) > version(msrv)
]
if wrong:
    sys.exit(f"minimum Rust version {msrv}: " + "; ".join(wrong))
print(f"minimum Rust version {msrv} holds for all {len(meta['packages'])} crates")
