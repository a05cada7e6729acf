#include "flare_package.h"
#include "flare_package.h"
int main(void) { return 0; }
