# CMAKE generated file: DO NOT EDIT!
# Timestamp file for compiler generated dependencies management for flare_cmake_smoke.
