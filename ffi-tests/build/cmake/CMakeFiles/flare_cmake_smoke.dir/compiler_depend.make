# Empty compiler generated dependencies file for flare_cmake_smoke.
# This may be replaced when dependencies are built.
