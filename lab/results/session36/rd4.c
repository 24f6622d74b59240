#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
// groups of gb bytes; NS streams read blk bytes from each group in turn
int main(int argc,char**argv){
  size_t n=(size_t)400<<20; char*b=aligned_alloc(64,n); memset(b,1,n);
  int NS=atoi(argv[1]); size_t gb=atol(argv[2]); int pf=atoi(argv[3]); size_t blk=512;
  size_t ng=n/gb/NS*NS;
  for(int r=0;r<5;r++){
    double t0=now(); __m512i acc[4]={0};
    for(size_t g=0; g<ng; g+=NS){
      for(size_t o=0;o<gb;o+=blk){
        for(int i=0;i<NS;i++){
          char*p=b+(g+i)*gb+o;
          for(int s=0;s<8;s++){ if(pf) _mm_prefetch(p+s*64+pf,_MM_HINT_T0); acc[s&3]=_mm512_add_epi32(acc[s&3],_mm512_load_si512(p+s*64)); }
        }
      }
    }
    double dt=now()-t0; __m512i a=_mm512_add_epi32(_mm512_add_epi32(acc[0],acc[1]),_mm512_add_epi32(acc[2],acc[3]));
    printf("NS %d gb %zu pf %d: %.1f GB/s (%d)\n",NS,gb,pf,ng*gb/dt/1e9,_mm512_reduce_add_epi32(a));
  }
}
