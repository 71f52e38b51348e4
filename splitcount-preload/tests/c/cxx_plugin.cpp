// A plugin written in C++ for a C program: its C++ runtime comes with it,
// loaded with RTLD_LOCAL (out of the global scope). A refused `new` must
// still reach the plugin's new-handler, then throw std::bad_alloc there.
#include <cstdio>
#include <new>

static int handler_calls = 0;

static void handler() {
    handler_calls++;
    std::set_new_handler(nullptr);
}

extern "C" int plugin_run(unsigned long n) {
    std::set_new_handler(handler);
    try {
        char *p = new char[n];
        p[0] = 1;
        delete[] p;
        std::printf("allocated %lu\n", n);
    } catch (const std::bad_alloc &) {
        std::printf("caught bad_alloc handler_calls=%d\n", handler_calls);
    }
    return 0;
}
