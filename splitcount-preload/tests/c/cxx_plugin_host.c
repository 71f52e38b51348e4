/* A C program that loads a C++ plugin (argv[1]) with RTLD_LOCAL and asks
 * it for argv[2] bytes. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        return 2;
    }
    setvbuf(stdout, NULL, _IONBF, 0);
    void *plugin = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (plugin == NULL) {
        printf("%s\n", dlerror());
        return 1;
    }
    int (*run)(unsigned long) = (int (*)(unsigned long))dlsym(plugin, "plugin_run");
    if (run == NULL) {
        return 1;
    }
    return run(strtoul(argv[2], NULL, 0));
}
