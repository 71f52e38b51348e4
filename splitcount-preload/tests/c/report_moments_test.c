/* The moments a preloaded program can report at, one per mode (the
 * argument). Each mode first holds 1,024 blocks of 1,000 bytes (about
 * 1 MiB, written), then:
 *
 *   snapshot  raise(SIGUSR2) (the live snapshot's signal when the test
 *             sets SPLITCOUNT_PRELOAD_SIGNAL=USR2), print "after snapshot",
 *             return 0 (the exit report follows);
 *   _exit     _exit(5): no atexit handler runs;
 *   segv      write through a null pointer: SIGSEGV;
 *   overflow  recurse until the main thread's stack overflows: SIGSEGV
 *             with no stack left to run a handler on;
 *   abort     abort(): SIGABRT;
 *   fork      fork a child that holds another 1,024 blocks and exits
 *             normally; the parent waits and returns 0;
 *   grandchild  fork a child that forks a grandchild; each exits
 *             normally once its own child has;
 *   daemon    fork a child that starts a session, prints "daemon <pid>",
 *             points 0, 1 and 2 at /dev/null and sleeps 5 s; the parent
 *             returns 0 at once.
 *
 * Built without the preload (plain C); the test reads the reports. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

enum { BLOCKS = 1024, SIZE = 1000 };

static void hold(char **blocks) {
  for (int i = 0; i < BLOCKS; i++) {
    blocks[i] = malloc(SIZE);
    if (blocks[i] == NULL) exit(1);
    memset(blocks[i], 0x5a, SIZE);
  }
}

/* Never set: the way out of the recursion is not taken. */
static volatile int stop;

/* A frame of 1 KiB a call that the compiler cannot fold into a loop. */
static int recurse(int n) {
  volatile char frame[1024];
  frame[0] = (char)n;
  if (stop) return 0;
  return recurse(n + 1) + frame[0];
}

int main(int argc, char **argv) {
  static char *kept[BLOCKS], *more[BLOCKS];
  if (argc != 2) {
    fprintf(stderr,
            "usage: report_moments_test snapshot|_exit|segv|overflow|abort|fork|grandchild|daemon\n");
    return 2;
  }
  const char *mode = argv[1];
  hold(kept);
  if (strcmp(mode, "snapshot") == 0) {
    raise(SIGUSR2);
    printf("after snapshot\n");
    return 0;
  }
  if (strcmp(mode, "_exit") == 0) _exit(5);
  if (strcmp(mode, "segv") == 0) {
    int *volatile null = NULL;
    *null = 1;
  }
  if (strcmp(mode, "overflow") == 0) {
    /* A bounded stack even under `ulimit -s unlimited`: the kernel checks
     * the limit as the stack grows. */
    struct rlimit eight = {8 << 20, 8 << 20};
    setrlimit(RLIMIT_STACK, &eight);
    return recurse(0);
  }
  if (strcmp(mode, "abort") == 0) abort();
  if (strcmp(mode, "fork") == 0) {
    pid_t child = fork();
    if (child == 0) {
      hold(more);
      exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
  }
  if (strcmp(mode, "grandchild") == 0) {
    for (int generation = 0; generation < 2; generation++) {
      pid_t child = fork();
      if (child < 0) return 1;
      if (child > 0) {
        int status = 0;
        waitpid(child, &status, 0);
        exit(WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1);
      }
    }
    exit(0); /* the grandchild */
  }
  if (strcmp(mode, "daemon") == 0) {
    pid_t child = fork();
    if (child < 0) return 1;
    if (child == 0) {
      setsid();
      printf("daemon %d\n", (int)getpid());
      fflush(stdout);
      int null = open("/dev/null", O_RDWR);
      dup2(null, 0);
      dup2(null, 1);
      dup2(null, 2);
      if (null > 2) close(null);
      sleep(5);
      exit(0);
    }
    return 0;
  }
  return 2;
}
