// The Catch2 main of ferry's host tests, compiled once.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
