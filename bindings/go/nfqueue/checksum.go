package nfqueue

/*
#include <zcio.h>
*/
import "C"

import (
	"runtime"
	"unsafe"

	"zcio/go/internal/zc"
)

func fixChecksums(p []byte) error {
	// The reason is per thread: read it on the thread that made the call.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	rc := C.zcio_fix_checksums(unsafe.Pointer(&p[0]), C.size_t(len(p)))
	return zc.Err("fixing checksums", int(rc))
}
