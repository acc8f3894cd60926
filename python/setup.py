"""`pip install --no-build-isolation ./python` (from the repository root): builds the rewind._C
extension with the project's own CMake (target rewind_python, against the LibTorch of the
python3 running pip) and installs the `rewind` package. The package's metadata (name, version,
dependencies) is in pyproject.toml; this file only hands the extension's build to CMake."""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = os.path.join(os.path.abspath(self.build_temp), "cmake")
        # The LibTorch of this python3's torch (pip's: not on CMake's default paths, and a
        # system LibTorch there, such as Debian's libtorch-dev, is another version): its folder
        # first, so that its lib/ also wins find_library, then torch.utils.cmake_prefix_path.
        torch_prefix = subprocess.check_output(
            [sys.executable, "-c", "import os, torch; print(os.path.dirname(torch.__file__) + ';' + "
             "torch.utils.cmake_prefix_path)"], text=True).strip()
        subprocess.check_call(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                               "-DREWIND_TESTS=OFF", f"-DREWIND_PYTHON3={sys.executable}",
                               f"-DCMAKE_PREFIX_PATH={torch_prefix}"])
        subprocess.check_call(["cmake", "--build", build, "--target", "rewind_python",
                               "-j", str(os.cpu_count() or 2)])
        built = glob.glob(os.path.join(build, "python", "rewind", "_C*.so"))
        if not built:
            raise RuntimeError("CMake did not build rewind._C (see its messages above)")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy(built[0], dest)


setup(ext_modules=[Extension("rewind._C", sources=[])], cmdclass={"build_ext": CMakeBuild})
