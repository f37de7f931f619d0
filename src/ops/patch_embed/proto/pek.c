// Prototype kernels for the Qwen2.5-VL patch embedding (Conv3d, kernel == stride, K = 392 positions x 3 ic).
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#define NPOS 392
#define IC 3
typedef struct { const float* x; const float* w; float* out; int P, OC, t, nt, mode, ftz; } job_t;

// x: [P][NPOS][IC] f32 (exact bf16/f16 values), w: [NPOS][IC][OC] f32, out: [P][OC] f32.
// mode 0: AMX TDPBF16PS emulation, one instruction per kernel position, pairs (ic0,ic1),(ic2,0):
//         e = x0*w0 ; e = fma(x2,w2,e) ; o = x1*w1 ; c += (e + o)   (FTZ+DAZ)
// mode 1: sequential FMA chain over (pos, ic) in memory order: c = fma(x,w,c) (the caller permutes ic)
#define RB 8
static void* work(void* arg){
  job_t* j=(job_t*)arg;
  unsigned old=_mm_getcsr();
  if(j->ftz) _mm_setcsr(old | 0x8040); // FTZ | DAZ, as the bf16 dot-product instructions
  int nvb=j->OC/32;                        // oc blocks of 32 (2 zmm)
  int nrb=(j->P+RB-1)/RB;
  long total=(long)nvb*nrb;
  long lo=total*j->t/j->nt, hi=total*(j->t+1)/j->nt;
  for(long it=lo; it<hi; ++it){
    int vb=it%nvb, rb=it/nvb;               // oc block fastest: x rows stay in cache
    int r0=rb*RB, nr=j->P-r0<RB? j->P-r0: RB;
    __m512 c[RB][2];
    for(int r=0;r<RB;++r){ c[r][0]=_mm512_setzero_ps(); c[r][1]=_mm512_setzero_ps(); }
    const float* wb=j->w+vb*32;
    for(int p=0;p<NPOS;++p){
      const float* wp=wb+(long)p*IC*j->OC;
      __m512 w00=_mm512_loadu_ps(wp), w01=_mm512_loadu_ps(wp+16);
      __m512 w10=_mm512_loadu_ps(wp+j->OC), w11=_mm512_loadu_ps(wp+j->OC+16);
      __m512 w20=_mm512_loadu_ps(wp+2*j->OC), w21=_mm512_loadu_ps(wp+2*j->OC+16);
      for(int r=0;r<RB;++r){
        if(r>=nr) break;
        const float* xp=j->x+((long)(r0+r)*NPOS+p)*IC;
        __m512 x0=_mm512_set1_ps(xp[0]), x1=_mm512_set1_ps(xp[1]), x2=_mm512_set1_ps(xp[2]);
        if(j->mode==0){
          __m512 e0=_mm512_mul_ps(x0,w00), e1=_mm512_mul_ps(x0,w01);
          e0=_mm512_fmadd_ps(x2,w20,e0); e1=_mm512_fmadd_ps(x2,w21,e1);
          __m512 o0=_mm512_mul_ps(x1,w10), o1=_mm512_mul_ps(x1,w11);
          c[r][0]=_mm512_add_ps(c[r][0],_mm512_add_ps(e0,o0));
          c[r][1]=_mm512_add_ps(c[r][1],_mm512_add_ps(e1,o1));
        } else {
          c[r][0]=_mm512_fmadd_ps(x0,w00,c[r][0]); c[r][1]=_mm512_fmadd_ps(x0,w01,c[r][1]);
          c[r][0]=_mm512_fmadd_ps(x1,w10,c[r][0]); c[r][1]=_mm512_fmadd_ps(x1,w11,c[r][1]);
          c[r][0]=_mm512_fmadd_ps(x2,w20,c[r][0]); c[r][1]=_mm512_fmadd_ps(x2,w21,c[r][1]);
        }
      }
    }
    for(int r=0;r<nr;++r){
      _mm512_storeu_ps(j->out+(long)(r0+r)*j->OC+vb*32, c[r][0]);
      _mm512_storeu_ps(j->out+(long)(r0+r)*j->OC+vb*32+16, c[r][1]);
    }
  }
  _mm_setcsr(old);
  return 0;
}
void pe_run(const float* x, const float* w, float* out, int P, int OC, int nt, int mode, int ftz){
  pthread_t th[64]; job_t jb[64];
  for(int t=0;t<nt;++t){ jb[t]=(job_t){x,w,out,P,OC,t,nt,mode,ftz}; if(t) pthread_create(&th[t],0,work,&jb[t]); }
  work(&jb[0]);
  for(int t=1;t<nt;++t) pthread_join(th[t],0);
}

// AMX replica: xb [P][NPOS][4] bf16 (ic padded with 0), wb [OC/16][NPOS][2 pairs][16 oc][2] bf16,
// out [P][OC] f32. One TDPBF16PS (K=4) per position, 2x2 tiles of 16x16.
typedef struct { uint8_t palette, start; uint8_t res[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
int amx_init(void){ return syscall(SYS_arch_prctl, 0x1023, 18); }
typedef struct { const uint16_t* x; const uint16_t* w; float* out; int P, OC, t, nt; } ajob_t;
static void* awork(void* arg){
  ajob_t* j=(ajob_t*)arg;
  cfg_t cfg __attribute__((aligned(64))); memset(&cfg,0,sizeof cfg); cfg.palette=1;
  for(int i=0;i<4;++i){ cfg.colsb[i]=64; cfg.rows[i]=16; }       // C tiles
  for(int i=4;i<6;++i){ cfg.colsb[i]=8; cfg.rows[i]=16; }        // A: 16 rows x 4 bf16
  for(int i=6;i<8;++i){ cfg.colsb[i]=64; cfg.rows[i]=2; }        // B: 2 pair-rows x 16 oc x 2
  _tile_loadconfig(&cfg);
  int nm=j->P/32, nn=j->OC/32;  // the caller pads P to a multiple of 32 (rows are independent)
  long total=(long)nm*nn, lo=total*j->t/j->nt, hi=total*(j->t+1)/j->nt;
  for(long it=lo; it<hi; ++it){
    int mb=it/nn, nb=it%nn;
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    const uint16_t* a0=j->x+(long)(mb*32)*NPOS*4;
    const uint16_t* a1=a0+(long)16*NPOS*4;
    const uint16_t* b0=j->w+(long)(nb*2)*NPOS*64;
    const uint16_t* b1=b0+(long)NPOS*64;
    for(int p=0;p<NPOS;++p){
      _tile_loadd(4, a0+p*4, NPOS*8);
      _tile_loadd(5, a1+p*4, NPOS*8);
      _tile_loadd(6, b0+p*64, 64);
      _tile_loadd(7, b1+p*64, 64);
      _tile_dpbf16ps(0,4,6); _tile_dpbf16ps(1,4,7); _tile_dpbf16ps(2,5,6); _tile_dpbf16ps(3,5,7);
    }
    float* o=j->out+(long)(mb*32)*j->OC+nb*32;
    _tile_stored(0,o,j->OC*4); _tile_stored(1,o+16,j->OC*4);
    _tile_stored(2,o+16*j->OC,j->OC*4); _tile_stored(3,o+16*j->OC+16,j->OC*4);
  }
  _tile_release();
  return 0;
}
void amx_run(const uint16_t* x, const uint16_t* w, float* out, int P, int OC, int nt){
  pthread_t th[64]; ajob_t jb[64];
  for(int t=0;t<nt;++t){ jb[t]=(ajob_t){x,w,out,P,OC,t,nt}; if(t) pthread_create(&th[t],0,awork,&jb[t]); }
  awork(&jb[0]);
  for(int t=1;t<nt;++t) pthread_join(th[t],0);
}
