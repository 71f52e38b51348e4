/* Prints the size and the resident kilobytes of the preload library's
 * executable mappings, and how many there are, read from /proc/self/smaps
 * at the start of main: "code_pages size=<KiB> rss=<KiB> mappings=<n>". */
#include <stdio.h>
#include <string.h>

int main(void) {
  char line[512];
  FILE *f = fopen("/proc/self/smaps", "r");
  if (f == NULL) return 2;
  int ours = 0;
  long size = 0, rss = 0, mappings = 0, kib;
  while (fgets(line, sizeof line, f)) {
    unsigned long from, to;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &from, &to, perms) == 3) {
      ours = strstr(line, "libsplitcount_preload") != NULL && strcmp(perms, "r-xp") == 0;
      mappings += ours;
      continue;
    }
    if (ours && sscanf(line, "Size: %ld kB", &kib) == 1) size += kib;
    if (ours && sscanf(line, "Rss: %ld kB", &kib) == 1) rss += kib;
  }
  fclose(f);
  printf("code_pages size=%ld rss=%ld mappings=%ld\n", size, rss, mappings);
  return size > 0 && mappings > 0 ? 0 : 1;
}
