#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t n=(size_t)400<<20; char*b=aligned_alloc(64,n); memset(b,1,n);
  int pf=argc>1?atoi(argv[1]):0;
  for(int r=0;r<6;r++){
    double t0=now(); __m512i acc=_mm512_setzero_si512(), acc2=acc, acc3=acc, acc4=acc;
    for(size_t i=0;i<n;i+=256){
      if(pf) _mm_prefetch(b+i+pf,_MM_HINT_T0);
      acc=_mm512_add_epi32(acc,_mm512_load_si512(b+i));
      acc2=_mm512_add_epi32(acc2,_mm512_load_si512(b+i+64));
      acc3=_mm512_add_epi32(acc3,_mm512_load_si512(b+i+128));
      acc4=_mm512_add_epi32(acc4,_mm512_load_si512(b+i+192));
    }
    double dt=now()-t0; acc=_mm512_add_epi32(_mm512_add_epi32(acc,acc2),_mm512_add_epi32(acc3,acc4));
    printf("pf %d: %.1f GB/s (%d)\n",pf,n/dt/1e9,_mm512_reduce_add_epi32(acc));
  }
}
