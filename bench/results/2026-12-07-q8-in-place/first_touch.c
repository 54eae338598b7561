// Time to fault in and zero an anonymous map of N MiB, with or without huge pages, the way a
// load fills its fresh weight pages. gcc -O2 first_touch.c -o first_touch && ./first_touch 4000 1
#include <sys/mman.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <stdlib.h>
int main(int c, char**v){ size_t n=(size_t)atol(v[1])<<20; int huge=atoi(v[2]);
 struct timespec a,b; clock_gettime(CLOCK_MONOTONIC,&a);
 char*p=mmap(0,n,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
 if(huge) madvise(p,n,MADV_HUGEPAGE);
 for(size_t i=0;i<n;i+=4096) p[i]=1;
 clock_gettime(CLOCK_MONOTONIC,&b);
 printf("%zu MB huge=%d: %.2f s\n", n>>20, huge, (b.tv_sec-a.tv_sec)+(b.tv_nsec-a.tv_nsec)/1e9);}
