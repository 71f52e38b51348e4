/* Prints the size and the resident kilobytes of the preload library's
 * executable mapping, read from /proc/self/smaps at the start of main:
 * "code_pages size=<KiB> rss=<KiB>". */
#include <stdio.h>
#include <string.h>

int main(void) {
  char line[512];
  FILE *f = fopen("/proc/self/smaps", "r");
  if (f == NULL) return 2;
  int ours = 0;
  long size = -1, rss = -1;
  while (fgets(line, sizeof line, f)) {
    unsigned long from, to;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &from, &to, perms) == 3) {
      ours = strstr(line, "libsplitcount_preload") != NULL && strcmp(perms, "r-xp") == 0;
      continue;
    }
    if (ours && sscanf(line, "Size: %ld kB", &size) == 1) continue;
    if (ours && sscanf(line, "Rss: %ld kB", &rss) == 1) ours = 0;
  }
  fclose(f);
  printf("code_pages size=%ld rss=%ld\n", size, rss);
  return size > 0 && rss >= 0 ? 0 : 1;
}
