"""Build hook: generate the protobuf stubs from the Lockside .proto into the wheel.

The stubs are made at build time, never committed, so the package always matches the
contract it is built from. The hook looks for the .proto at

  proto/lockside/v1/lockside.proto        inside this directory (an sdist carries it), or
  ../../proto/lockside/v1/lockside.proto  the repository checkout this directory is in,

runs grpcio-tools' protoc on it in a temporary directory, and adds
`lockside/_pb/lockside_pb2.py` and its `.pyi` type stubs to the wheel. An sdist gets the
.proto itself, so a wheel can be built from the sdist alone.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PROTO = os.path.join("lockside", "v1", "lockside.proto")


class CustomBuildHook(BuildHookInterface):
    """Generates `lockside/_pb/*` for wheels; ships the .proto in sdists."""

    PLUGIN_NAME = "custom"

    def _proto_root(self) -> str:
        for root in (
            os.path.join(self.root, "proto"),
            os.path.join(self.root, os.pardir, os.pardir, "proto"),
        ):
            if os.path.isfile(os.path.join(root, PROTO)):
                return os.path.normpath(root)
        raise RuntimeError(
            f"lockside build: {PROTO} not found in {self.root}/proto or the repository "
            "two levels up; build from a Lockside checkout or from its sdist"
        )

    def initialize(self, version: str, build_data: dict) -> None:
        proto_root = self._proto_root()
        if self.target_name == "sdist":
            build_data["force_include"][os.path.join(proto_root, PROTO)] = os.path.join(
                "proto", PROTO
            )
            return
        if self.target_name != "wheel":
            return

        import grpc_tools
        from grpc_tools import protoc

        self._out = tempfile.mkdtemp(prefix="lockside-stubs-")
        # The well-known types (google/protobuf/duration.proto) ship with grpcio-tools.
        well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        # Compiled as `lockside/v1/lockside.proto` (its name in every other language),
        # so the descriptor registers under the same file name as other stubs would.
        status = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{proto_root}",
                f"-I{well_known}",
                f"--python_out={self._out}",
                f"--pyi_out={self._out}",
                os.path.join(proto_root, PROTO),
            ]
        )
        if status != 0:
            raise RuntimeError(f"lockside build: protoc failed on {PROTO} ({status})")
        generated = os.path.join(self._out, "lockside", "v1")
        self._check_runtime_pin(os.path.join(generated, "lockside_pb2.py"))
        self._private_pool(os.path.join(generated, "lockside_pb2.py"))
        for name in ("lockside_pb2.py", "lockside_pb2.pyi"):
            build_data["force_include"][os.path.join(generated, name)] = (
                f"lockside/_pb/{name}"
            )

    def _check_runtime_pin(self, pb2: str) -> None:
        """Fail the build when the stubs need a newer protobuf than the package asks for.

        protoc stamps the stubs with its version and they refuse an older runtime at
        import; the `protobuf>=` lower bound in pyproject.toml must keep up with the
        grpcio-tools pin, or users would install a package that cannot import.
        """
        with open(pb2, encoding="utf-8") as f:
            stamp = re.search(r"Protobuf Python Version: (\d+)\.(\d+)\.(\d+)", f.read())
        deps = self.metadata.core.dependencies
        floor = next(
            (re.search(r">=\s*(\d+)\.(\d+)\.(\d+)", d) for d in deps if d.startswith("protobuf")),
            None,
        )
        if stamp and floor:
            made = tuple(int(x) for x in stamp.groups())
            asked = tuple(int(x) for x in floor.groups())
            if made > asked:
                raise RuntimeError(
                    "lockside build: the stubs need protobuf>=%d.%d.%d but pyproject.toml "
                    "asks for protobuf>=%d.%d.%d; raise the bound" % (made + asked)
                )

    def _private_pool(self, pb2: str) -> None:
        """Registers the messages in a descriptor pool of their own, not protobuf's
        default one: an application that generated its own stubs of lockside.proto
        (say, from the old example, under another file name) would otherwise fail to
        import this package with "duplicate symbol 'lockside.v1.LockMode'"."""
        with open(pb2, encoding="utf-8") as f:
            code = f.read()
        default = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
        if code.count(default) != 1 or "google_dot_protobuf_dot_duration__pb2" not in code:
            raise RuntimeError("lockside build: protoc's output changed; adapt _private_pool")
        code = code.replace(
            default,
            "_pool = _descriptor_pool.DescriptorPool()\n"
            "_pool.AddSerializedFile(google_dot_protobuf_dot_duration__pb2.DESCRIPTOR.serialized_pb)\n"
            "DESCRIPTOR = _pool.AddSerializedFile(",
        )
        with open(pb2, "w", encoding="utf-8") as f:
            f.write(code)

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        out = getattr(self, "_out", None)
        if out:
            shutil.rmtree(out, ignore_errors=True)
