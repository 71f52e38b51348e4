/* glibc's tuning as the program leaves it: a 1 MiB block is mmapped (the
 * default threshold, 128 KiB, untouched), and freeing it gives its memory
 * back to the kernel at once. Run with and without the preload; the two
 * outputs must be the same. (A start-up probe of the preload's that
 * allocated and freed blocks up to 4 MiB raised the dynamic mmap threshold
 * to ~4 MiB and the trim threshold to ~8 MiB: the block then came from the
 * heap and stayed resident after free.) Prints two lines. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  struct mallinfo2 before = mallinfo2();
  char *p = malloc(1 << 20);
  if (p == NULL) return 1;
  memset(p, 1, 1 << 20);
  struct mallinfo2 held = mallinfo2();
  printf("1 MiB block mmapped: %s\n", held.hblkhd > before.hblkhd ? "yes" : "no");
  free(p);
  struct mallinfo2 after = mallinfo2();
  printf("freed 1 MiB back to the kernel: %s\n",
         after.hblkhd == before.hblkhd ? "yes" : "no");
  return 0;
}
