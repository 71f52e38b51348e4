/* A main thread that ends with pthread_exit while another thread runs: the
 * process ends with the last thread (through exit). Before that, main
 * allocates and frees enough to fill its reserve (the bytes the
 * accounting charges ahead for a thread), and the other thread allocates
 * nothing.
 *
 * glibc runs no thread-local destructor for a main thread that leaves by
 * pthread_exit; the exit report must still find the reserve returned:
 * usage at exit is what the program holds (stdio's buffer), not that plus
 * the reserve.
 *
 * Built without the preload (plain C); the test reads the report. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *outlive_main(void *arg) {
  usleep(100 * 1000);
  return arg;
}

int main(void) {
  for (int i = 0; i < 100; i++) {
    char *p = malloc(3000);
    if (p == NULL) return 1;
    memset(p, 1, 3000);
    free(p);
  }
  pthread_t t;
  if (pthread_create(&t, NULL, outlive_main, NULL) != 0) return 1;
  pthread_exit(NULL);
}
