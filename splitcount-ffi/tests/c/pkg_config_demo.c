/* The smallest C project on the installed library: built with
 *   cc demo.c $(pkg-config --cflags --libs splitcount)
 * (tests/pkg_config.rs installs into a temporary prefix and does that).
 * Prints "pkg_config_demo: <version> ok". */
#include <splitcount.h>

#include <stdio.h>
#include <string.h>

int main(void) {
  char expected[32];
  snprintf(expected, sizeof expected, "%d.%d.%d", SPLITCOUNT_VERSION_MAJOR,
           SPLITCOUNT_VERSION_MINOR, SPLITCOUNT_VERSION_PATCH);
  if (strcmp(splitcount_version(), expected) != 0) {
    fprintf(stderr, "header %s, library %s\n", expected, splitcount_version());
    return 1;
  }
  splitcount_hierarchy *h = NULL;
  splitcount_group *root = NULL, *tenant = NULL;
  uint64_t usage = 1;
  if (splitcount_hierarchy_create_with(NULL, 0, SPLITCOUNT_STOCK_BATCH_BYTES,
                                       SPLITCOUNT_STOCK_SLOTS_MAX, &h) != SPLITCOUNT_OK ||
      splitcount_hierarchy_root(h, &root) != SPLITCOUNT_OK ||
      splitcount_group_child(root, "tenant", &tenant) != SPLITCOUNT_OK ||
      splitcount_group_set_max(tenant, 1 << 20) != SPLITCOUNT_OK ||
      splitcount_group_try_charge(tenant, 1000) != SPLITCOUNT_OK ||
      splitcount_group_try_charge(tenant, 2 << 20) != SPLITCOUNT_E_LIMIT ||
      splitcount_group_uncharge(tenant, 1000) != SPLITCOUNT_OK ||
      splitcount_group_usage_exact(tenant, &usage) != SPLITCOUNT_OK || usage != 0) {
    fprintf(stderr, "failed: %s\n", splitcount_last_error());
    return 1;
  }
  splitcount_group_release(tenant);
  splitcount_group_release(root);
  splitcount_hierarchy_destroy(h);
  printf("pkg_config_demo: %s ok\n", splitcount_version());
  return 0;
}
