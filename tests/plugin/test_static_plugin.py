"""hubproxy-plugin (issue 23): hubproxy-creds as one static executable in a FROM-scratch image.

Built with deploy/plugin/build.sh (see tests/plugin/static.py: cached by its inputs, root and
buildah needed, never skipped under CI=true), then run the way consumers run it: from the
image's root filesystem alone, read-only, as uid 65532, with only an emptyDir writable, and with
KUBERNETES_EXEC_INFO as client-go writes it.

How these tests show that no Python and no C library of this machine is used: the root the
plugin runs in holds the image's one file and empty mount points, nothing else (listed before the
run); the executable has no program interpreter and no dynamic section (the kernel runs it
directly, it names no library to load); and a dynamically linked program copied into the same
kind of root fails to start, as kubernetes-sigs/kueue#8751's plugin did.
"""

from __future__ import annotations

import base64
import json
import shutil
import statistics
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.ops.version import version
from tests.plugin.static import (
    EXECUTABLE_IN_IMAGE,
    NOBODY,
    V1,
    V1BETA1,
    StaticPlugin,
    Volume,
    buildah,
    built,
    exec_info,
    files_under,
    image_root,
    run,
    run_isolated,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
ROOT_DIR = Path(__file__).resolve().parents[2]
MAX_EXECUTABLE_BYTES = 25_000_000
COLD_START_LIMIT_SECONDS = 1.0  # the aim is 0.3 s; this bound only catches a regression
PT_INTERP, PT_DYNAMIC = 3, 2


@pytest.fixture(scope="module")
def plugin() -> StaticPlugin:
    return built()


@pytest.fixture
def image_files(plugin: StaticPlugin) -> Iterator[Path]:
    with image_root(plugin.tag) as root:
        yield root


def jwt(claims: dict[str, object]) -> str:
    def part(obj: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2lnbmF0dXJl"


TOKEN = jwt({"exp": 2000000000, "sub": "system:serviceaccount:kueue-system:kueue-controller"})


def consumer_root(tmp_path: Path, image_files: Path, name: str = "root") -> Path:
    """A root like the image's: a copy of its files, nothing else."""
    root = tmp_path / name
    shutil.copytree(image_files, root, symlinks=True)
    return root


def service_account(tmp_path: Path, token: str | None, mode: int = 0o644) -> Volume:
    """The pod's projected service-account volume (read-only), holding `token` if given."""
    directory = tmp_path / "serviceaccount"
    directory.mkdir(exist_ok=True)
    if token is not None:
        (directory / "token").write_text(token)
        (directory / "token").chmod(mode)
    return Volume(SA_DIR, directory, read_only=True)


def program_headers(path: Path) -> list[int]:
    """The p_type of each ELF program header of a 64-bit little-endian executable."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "not an ELF64 LE file"
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return [struct.unpack_from("<I", data, phoff + i * phentsize)[0] for i in range(phnum)]


def test_image_is_one_static_executable_as_65532_with_no_entrypoint(
        plugin: StaticPlugin, image_files: Path) -> None:
    """cluster-inventory-api's plugin image convention (hack/Dockerfile.plugin)."""
    assert files_under(image_files) == [EXECUTABLE_IN_IMAGE]
    executable = image_files / EXECUTABLE_IN_IMAGE
    assert executable.stat().st_mode & 0o777 == 0o555
    kinds = program_headers(executable)
    assert PT_INTERP not in kinds and PT_DYNAMIC not in kinds, kinds
    assert executable.read_bytes() == plugin.executable.read_bytes()
    inspected = run(*buildah("inspect", "--type", "image", plugin.tag))
    assert inspected.returncode == 0, inspected.stderr
    config = json.loads(inspected.stdout)["OCIv1"]["config"]
    assert config.get("User") == f"{NOBODY}:{NOBODY}"
    assert not config.get("Entrypoint") and not config.get("Cmd"), config
    size = executable.stat().st_size
    image_size = run(*buildah("images", "--noheading", "--format", "{{.Size}}", plugin.tag))
    print(f"hubproxy-plugin: {size / 1e6:.1f} MB; image {image_size.stdout.strip()}; "
          f"build.sh {plugin.build_seconds:.0f} s")
    assert size <= MAX_EXECUTABLE_BYTES, size


def test_a_dynamic_program_cannot_start_in_such_a_root(tmp_path: Path) -> None:
    """The control: the root has no loader and no C library, so only a static program runs."""
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    dynamic = Path(shutil.which("true") or "/bin/true").resolve()
    assert PT_INTERP in program_headers(dynamic)
    shutil.copy(dynamic, root / "bin" / "true")
    done = run_isolated(root, ["/bin/true"], {}, [Volume("/tmp")])
    assert done.returncode == 127, (done.returncode, done.stderr)
    assert "No such file or directory" in done.stderr


@pytest.mark.parametrize("api_version", [V1, V1BETA1])
def test_answers_client_go_from_an_empty_read_only_root(
        tmp_path: Path, image_files: Path, api_version: str) -> None:
    root = consumer_root(tmp_path, image_files)
    emptydir = tmp_path / "emptydir"
    emptydir.mkdir(mode=0o777)
    emptydir.chmod(0o777)
    assert files_under(root) == [EXECUTABLE_IN_IMAGE]
    done = run_isolated(root, ["/bin/hubproxy-plugin"],
                        {"KUBERNETES_EXEC_INFO": exec_info(api_version), "TMPDIR": "/scratch"},
                        [service_account(tmp_path, TOKEN), Volume("/scratch", emptydir)])
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert json.loads(done.stdout) == {
        "apiVersion": api_version, "kind": "ExecCredential",
        "status": {"token": TOKEN, "expirationTimestamp": "2033-05-18T03:33:20Z"}}
    # It unpacked itself into TMPDIR and left nothing there.
    assert list(emptydir.iterdir()) == []


def test_a_locale_the_root_lacks_does_not_stop_it(tmp_path: Path, image_files: Path) -> None:
    """Consumers' environments often say LANG=C.UTF-8; a scratch-like root has no locales."""
    root = consumer_root(tmp_path, image_files)
    done = run_isolated(root, ["/bin/hubproxy-plugin"],
                        {"KUBERNETES_EXEC_INFO": exec_info(V1), "LANG": "C.UTF-8",
                         "LC_ALL": "C.UTF-8"},
                        [service_account(tmp_path, TOKEN), Volume("/tmp")])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"]["token"] == TOKEN


def one_line_failure(done: subprocess.CompletedProcess[str], code: int, needle: str) -> None:
    assert done.returncode == code, (done.returncode, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], done.stderr
    assert TOKEN not in done.stderr


def test_error_paths_are_one_line_on_stderr(tmp_path: Path, image_files: Path) -> None:
    root = consumer_root(tmp_path, image_files)
    info = {"KUBERNETES_EXEC_INFO": exec_info(V1)}
    tmp = Volume("/tmp")
    # No token file: the pod has no service-account token mounted.
    one_line_failure(run_isolated(root, ["/bin/hubproxy-plugin"], info,
                                  [service_account(tmp_path, None), tmp]),
                     1, f"cannot read token file {SA_DIR}/token: No such file or directory")
    # Unreadable: the file is root's, mode 0600; the plugin runs as 65532.
    one_line_failure(run_isolated(root, ["/bin/hubproxy-plugin"], info,
                                  [service_account(tmp_path, TOKEN, 0o600), tmp]),
                     1, "Permission denied")
    # Empty.
    one_line_failure(run_isolated(root, ["/bin/hubproxy-plugin"], info,
                                  [service_account(tmp_path, "", 0o644), tmp]),
                     1, "is empty")
    sa = service_account(tmp_path, TOKEN)
    # No cluster information (provideClusterInfo: false), and no KUBERNETES_EXEC_INFO at all.
    one_line_failure(run_isolated(root, ["/bin/hubproxy-plugin"],
                                  {"KUBERNETES_EXEC_INFO": exec_info(V1, None)}, [sa, tmp]),
                     1, "provideClusterInfo")
    one_line_failure(run_isolated(root, ["/bin/hubproxy-plugin"], {}, [sa, tmp]),
                     1, "KUBERNETES_EXEC_INFO is not set")
    # The hub modes are not in this build; it says so instead of failing to import.
    one_line_failure(run_isolated(root, ["/bin/hubproxy-plugin", "--managed-serviceaccount",
                                         "kueue"], info, [sa, tmp]),
                     1, "leaves out")
    # No writable TMPDIR (the read-only root's /tmp): it cannot unpack itself, and says where.
    one_line_failure(run_isolated(root, ["/bin/hubproxy-plugin"], info, [sa]),
                     2, "Failed to create temporary directory in /tmp")


def test_a_token_without_exp_gets_no_expiry(tmp_path: Path, image_files: Path) -> None:
    """An opaque token (or a legacy service-account token) has no `exp`: the credential then
    carries no expirationTimestamp, and client-go keeps it until a 401, as it does today."""
    root = consumer_root(tmp_path, image_files)
    opaque = jwt({"sub": "system:serviceaccount:apps:legacy"})
    done = run_isolated(root, ["/bin/hubproxy-plugin"], {"KUBERNETES_EXEC_INFO": exec_info(V1)},
                        [service_account(tmp_path, opaque), Volume("/tmp")])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == {"token": opaque}


def test_version_is_the_package_release(tmp_path: Path, image_files: Path) -> None:
    root = consumer_root(tmp_path, image_files)
    done = run_isolated(root, ["/bin/hubproxy-plugin", "--version"], {}, [Volume("/tmp")])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"hubproxy-creds {version()}"


def test_an_init_container_installs_it_where_image_volumes_are_missing(
        tmp_path: Path, image_files: Path) -> None:
    """The fallback: the plugin image runs `--install` into an emptyDir, which the consumer
    (a different, empty root) mounts and runs the copy from."""
    plugins = tmp_path / "plugins-emptydir"
    plugins.mkdir(mode=0o777)
    plugins.chmod(0o777)
    init_root = consumer_root(tmp_path, image_files, "init")
    target = "/plugins/hubproxy/bin/hubproxy-plugin"
    done = run_isolated(init_root, ["/bin/hubproxy-plugin", "--install", target], {},
                        [Volume("/plugins/hubproxy", plugins), Volume("/tmp")])
    assert done.returncode == 0, done.stderr
    assert (plugins / "bin" / "hubproxy-plugin").stat().st_mode & 0o777 == 0o555
    consumer = tmp_path / "consumer"
    consumer.mkdir()
    done = run_isolated(consumer, [target], {"KUBERNETES_EXEC_INFO": exec_info(V1BETA1)},
                        [Volume("/plugins/hubproxy", plugins, read_only=True),
                         service_account(tmp_path, TOKEN), Volume("/tmp")])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["apiVersion"] == V1BETA1


def test_cold_start(plugin: StaticPlugin, tmp_path: Path) -> None:
    """Median of 20 runs (each a whole credential refresh: unpack, answer, clean up)."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    env = {"KUBERNETES_EXEC_INFO": exec_info(V1), "TMPDIR": str(tmp_path), "PATH": "/usr/bin"}
    command = [str(plugin.executable), "--token-file", str(token)]
    assert subprocess.run(command, env=env, capture_output=True, timeout=30).returncode == 0
    times = []
    for _ in range(20):
        started = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, timeout=30)
        times.append(time.perf_counter() - started)
        assert done.returncode == 0, done.stderr
    median = statistics.median(times)
    print(f"hubproxy-plugin cold start: median {median * 1000:.0f} ms of 20 "
          f"(min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f})")
    assert median < COLD_START_LIMIT_SECONDS, times


def test_demo_providers_file_names_the_static_plugin_once_built(
        plugin: StaticPlugin, tmp_path: Path) -> None:
    """`hubproxy demo` finds build.sh's executable where build.sh leaves it (the same default,
    ~/.cache/hubproxy-plugin, or HUBPROXY_PLUGIN_CACHE), and falls back to this Python's
    hubproxy-creds; both answer as an exec plugin."""
    import os

    from gateway.demo import creds_command, static_plugin
    from tests.plugin.static import PLUGIN_CACHE

    if not ({"HUBPROXY_PLUGIN_CACHE", "XDG_CACHE_HOME"} & set(os.environ)):
        assert static_plugin({}) == plugin.executable  # both defaults agree
    assert static_plugin({"HUBPROXY_PLUGIN_CACHE": str(PLUGIN_CACHE)}) == plugin.executable
    assert static_plugin({"HUBPROXY_PLUGIN_CACHE": str(tmp_path)}) is None
    token = tmp_path / "token"
    token.write_text(TOKEN)
    env = {"KUBERNETES_EXEC_INFO": exec_info(V1), "TMPDIR": str(tmp_path),
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    for found, expected in ((plugin.executable, str(plugin.executable)), (None, "python")):
        exec_config = creds_command(found, token)
        assert expected in exec_config["command"]
        done = subprocess.run([exec_config["command"], *exec_config["args"]], env=env,
                              capture_output=True, text=True, timeout=60, cwd=ROOT_DIR)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["status"]["token"] == TOKEN
