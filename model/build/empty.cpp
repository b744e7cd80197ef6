/* model/build/cc-launcher compiles this in place of a llama.cpp source flock-model never runs. */
