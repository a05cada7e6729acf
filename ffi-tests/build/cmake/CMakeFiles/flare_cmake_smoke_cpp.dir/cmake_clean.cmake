file(REMOVE_RECURSE
  "CMakeFiles/flare_cmake_smoke_cpp.dir/main.cpp.o"
  "CMakeFiles/flare_cmake_smoke_cpp.dir/main.cpp.o.d"
  "flare_cmake_smoke_cpp"
  "flare_cmake_smoke_cpp.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang CXX)
  include(CMakeFiles/flare_cmake_smoke_cpp.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
