<%! from aotconv.outdir import pc_escape %>\
prefix=${pc_escape(prefix)}
libdir=${"${prefix}"}
includedir=${"${prefix}"}

Name: ${name}
Description: aotconv-compiled network ${name} for target ${target}
Version: ${version}
Requires.private: OpenCL
Libs: -L${"${libdir}"} -l${name}
Libs.private: -lOpenCL -pthread
Cflags: -I${"${includedir}"}
