file(REMOVE_RECURSE
  "CMakeFiles/flare_cmake_smoke.dir/main.c.o"
  "CMakeFiles/flare_cmake_smoke.dir/main.c.o.d"
  "flare_cmake_smoke"
  "flare_cmake_smoke.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/flare_cmake_smoke.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
