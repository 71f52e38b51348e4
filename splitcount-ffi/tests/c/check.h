/* The checks of the C tests (this crate's and the preload's): a failed
 * check prints its file, line and expression with splitcount_last_error()
 * and exits 1; `checks` counts the checks made. */
#ifndef SPLITCOUNT_TEST_CHECK_H
#define SPLITCOUNT_TEST_CHECK_H

#include "splitcount.h"

#include <stdio.h>
#include <stdlib.h>

static int checks;

#define CHECK(cond)                                                            \
  do {                                                                         \
    checks++;                                                                  \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__,   \
              __LINE__, #cond, splitcount_last_error());                       \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

#define OK(call) CHECK((call) == SPLITCOUNT_OK)
#define FAILS(call, code) CHECK((call) == (code))

#endif
