/* A program that takes its stderr away before it ends, as coreutils'
 * close_stdout does: `close` closes stdout and stderr in an atexit handler
 * (registered after the preload's, so run before it); `reuse <path>`
 * closes descriptor 2 and opens <path>, which takes it, and writes its own
 * data there. The preload's exit report must reach the stderr the program
 * started with, and never the program's file. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void close_std_streams(void) {
    fclose(stdout);
    fclose(stderr);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        return 2;
    }
    void *held = malloc(1000);
    if (held == NULL) {
        return 1;
    }
    puts("running");
    if (strcmp(argv[1], "close") == 0) {
        atexit(close_std_streams);
    } else if (strcmp(argv[1], "reuse") == 0 && argc == 3) {
        close(2);
        int fd = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd != 2) {
            return 3;
        }
        if (write(fd, "data\n", 5) != 5) {
            return 4;
        }
    } else {
        return 2;
    }
    free(held);
    return 0;
}
