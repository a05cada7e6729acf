# Empty dependencies file for flare_cmake_smoke_cpp.
# This may be replaced when dependencies are built.
