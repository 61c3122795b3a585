// fmt's implementation, compiled once, here. fmt is used from its headers alone (libfmt-dev, no
// library linked); with FMT_HEADER_ONLY every file that formats compiled that implementation
// again (about 4 s a file at -O3, two thirds of the build's CPU time). The other files include
// the headers without it and link these definitions: format-inl.h's functions, and the
// instantiations format.h declares extern (what fmt's own src/format.cc instantiates).
#include <fmt/format-inl.h>

#if FMT_VERSION / 10000 != 9
#error "support/Fmt.cpp instantiates what fmt 9's format.h declares extern; another version needs its own list"
#endif

FMT_BEGIN_NAMESPACE
namespace detail {

template FMT_API auto dragonbox::to_decimal(float x) noexcept -> dragonbox::decimal_fp<float>;
template FMT_API auto dragonbox::to_decimal(double x) noexcept -> dragonbox::decimal_fp<double>;

#ifndef FMT_STATIC_THOUSANDS_SEPARATOR
template FMT_API locale_ref::locale_ref(const std::locale &loc);
template FMT_API auto locale_ref::get<std::locale>() const -> std::locale;
#endif

template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<char>;
template FMT_API auto decimal_point_impl(locale_ref) -> char;
template FMT_API void buffer<char>::append(const char *, const char *);
template FMT_API void vformat_to(buffer<char> &, string_view, basic_format_args<FMT_BUFFER_CONTEXT(char)>,
                                 locale_ref);

template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<wchar_t>;
template FMT_API auto decimal_point_impl(locale_ref) -> wchar_t;
template FMT_API void buffer<wchar_t>::append(const wchar_t *, const wchar_t *);

} // namespace detail
FMT_END_NAMESPACE
