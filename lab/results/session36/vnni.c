#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){
  __m512i a[NC]; for(int i=0;i<NC;i++) a[i]=_mm512_set1_epi32(i);
  __m512i w=_mm512_set1_epi8(3), x=_mm512_set1_epi8(5);
  long n=200000000;
  for(int r=0;r<3;r++){
  double t0=now();
  for(long i=0;i<n;i++){
    for(int j=0;j<NC;j++) a[j]=_mm512_dpbusd_epi32(a[j],w,x);
    __asm__ volatile("" : "+v"(w), "+v"(x));
  }
  double dt=now()-t0; __m512i s=a[0]; for(int j=1;j<NC;j++) s=_mm512_add_epi32(s,a[j]);
  printf("%.1f G vpdpbusd/s = %.0f GMAC/s (%d)\n", n*NC/dt/1e9, n*NC*64/dt/1e9, _mm512_reduce_add_epi32(s));
  }
}
